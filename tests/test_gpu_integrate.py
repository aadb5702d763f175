"""gpu/integrate.py: a session's results come into data/sweeps only when every check passes.

Each session did these steps by hand (join the parts, unpack, check replay exactness, copy without the runtime
files); on 2026-12-07 a stop call's results ended in an invocation that ran nothing, and the integrator had to
notice it and take an earlier call's tarball.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile

from tests.gpu_scripts import load


def _module():
    return load("integrate")


def _sweep(root, name, cells, exact=True, invocations=None):
    s = root / name
    for sub in ("runs", "steps", "replay", "logs", ".run"):
        (s / sub).mkdir(parents=True, exist_ok=True)
    for c in cells:
        (s / "runs" / f"{c}.parquet").write_bytes(b"r" + c.encode())
        (s / "steps" / f"{c}.parquet").write_bytes(b"s" + c.encode())
        (s / "replay" / f"{c}.json").write_text(json.dumps({"exact": exact}))
    (s / "logs" / "engine.log").write_text("log")
    (s / ".sweep.lock").write_text("")
    invs = invocations if invocations is not None else [{"engines": [{"method": "none"}], "cells_done": len(cells)}]
    (s / "provenance.json").write_text(json.dumps({"sweep": name, "invocations": invs}))
    return s


def _parts(res, out, part_bytes=200):
    """res/ packed as session.sh packs it: a tgz split into parts."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(res, arcname=".")
    data = buf.getvalue()
    out.mkdir()
    for i in range(0, len(data), part_bytes):
        (out / f"res.tgz.part{i // part_bytes:02d}").write_bytes(data[i:i + part_bytes])
    assert len(list(out.iterdir())) > 1
    return out


def test_new_cells_come_in_without_runtime_files(tmp_path, capsys):
    mod = _module()
    into = tmp_path / "sweeps"
    first = [{"engines": [{"method": "none"}], "cells_done": 1}]
    _sweep(into, "sw", ["llama-3.1-8b__a"], invocations=first)
    (into / "sw" / ".sweep.lock").unlink()
    shutil.rmtree(into / "sw" / "logs")
    res = _sweep(tmp_path / "res", "sw", ["llama-3.1-8b__a", "llama-3.1-8b__b"], invocations=first * 2).parent
    src = _parts(res, tmp_path / "dev")
    assert mod.main([str(src), "--into", str(into)]) == 0
    got = into / "sw"
    assert sorted(p.name for p in (got / "runs").iterdir()) == ["llama-3.1-8b__a.parquet", "llama-3.1-8b__b.parquet"]
    assert not (got / "logs").exists() and not (got / ".sweep.lock").exists()
    assert "sw: 1 -> 2 cells (1 new, 1 carried back); 2 replay files in the session's copy, 2 exact" in \
        capsys.readouterr().out


def test_an_inexact_replay_copies_nothing(tmp_path, capsys):
    mod = _module()
    into = tmp_path / "sweeps"
    into.mkdir()
    src = _sweep(tmp_path / "res", "sw", ["a"], exact=False).parent
    assert mod.main([str(src), "--into", str(into)]) == 1
    assert not (into / "sw").exists()
    assert "1 of 1 replay files not exact" in capsys.readouterr().err


def test_a_session_that_does_not_extend_the_committed_provenance_copies_nothing(tmp_path, capsys):
    mod = _module()
    into = tmp_path / "sweeps"
    _sweep(into, "sw", ["m.0__a"], invocations=[{"engines": [{"method": "none"}], "cells_done": 1, "at": 1}])
    src = _sweep(tmp_path / "res", "sw", ["m.0__b"]).parent
    assert mod.main([str(src), "--into", str(into)]) == 1
    assert not (into / "sw" / "runs" / "m.0__b.parquet").exists()
    assert "does not begin with the 1 committed invocation(s)" in capsys.readouterr().err


def test_an_empty_trailing_invocation_is_refused_or_dropped_on_request(tmp_path, capsys):
    mod = _module()
    into = tmp_path / "sweeps"
    into.mkdir()
    invs = [{"engines": [{"method": "none"}], "cells_done": 1}, {"engines": [], "cells_planned": 24}]
    src = _sweep(tmp_path / "res", "sw", ["a"], invocations=invs).parent
    assert mod.main([str(src), "--into", str(into)]) == 1
    assert "ran no engine and finished no cell" in capsys.readouterr().err
    assert mod.main([str(src), "--into", str(into), "--dry-run", "--drop-empty"]) == 0
    assert not (into / "sw").exists()
    assert mod.main([str(src), "--into", str(into), "--drop-empty"]) == 0
    prov = json.loads((into / "sw" / "provenance.json").read_text())
    assert prov["invocations"] == invs[:1]
    assert mod.empty_tail(invs + [{"engines": [], "cells_done": 0}]) == 2


def test_a_cut_invocation_that_ran_cells_is_kept_and_a_committed_one_is_never_dropped(tmp_path, capsys):
    """A job cut before it wrote its engines leaves an invocation with none, though it ran cells (three committed
    invocations of the H100 headline are so): kept, with a note. --drop-empty drops only the session's own."""
    mod = _module()
    into = tmp_path / "sweeps"
    committed = [{"engines": [{"method": "none"}], "cells_done": 1}, {"engines": [], "cells_planned": 4}]
    _sweep(into, "sw", ["a"], invocations=committed)
    cut = committed + [{"engines": [], "cells_planned": 4}]
    src = _sweep(tmp_path / "res", "sw", ["a", "b"], invocations=cut).parent
    assert mod.main([str(src), "--into", str(into), "--drop-empty"]) == 0
    out = capsys.readouterr().out
    assert "a job cut before it wrote its provenance; kept" in out and "dropped" not in out
    assert json.loads((into / "sw" / "provenance.json").read_text())["invocations"] == cut
    # the same tail with no new cell is the session's empty invocation: dropped, the committed empty one kept
    src2 = _sweep(tmp_path / "res2", "sw", ["a", "b"], invocations=cut + [{"engines": []}]).parent
    assert mod.main([str(src2), "--into", str(into), "--drop-empty"]) == 0
    assert json.loads((into / "sw" / "provenance.json").read_text())["invocations"] == cut


def test_a_carried_back_file_with_other_contents_copies_nothing(tmp_path, capsys):
    mod = _module()
    into = tmp_path / "sweeps"
    first = [{"engines": [{"method": "none"}], "cells_done": 1}]
    _sweep(into, "sw", ["a"], invocations=first)
    res = _sweep(tmp_path / "res", "sw", ["a", "b"], invocations=first * 2)
    (res / "steps" / "a.parquet").write_bytes(b"rewritten")
    (res / "steps" / ".b.parquet.tmp").write_bytes(b"half")  # a half-written file is never copied
    assert mod.main([str(res.parent), "--into", str(into)]) == 1
    assert "1 file(s) the sweep already has come back with other contents, e.g. steps/a.parquet" in \
        capsys.readouterr().err
    (res / "steps" / "a.parquet").write_bytes(b"sa")
    assert mod.main([str(res.parent), "--into", str(into)]) == 0
    assert not (into / "sw" / "steps" / ".b.parquet.tmp").exists() and (into / "sw" / "steps" / "b.parquet").exists()


def test_a_session_under_another_config_is_copied_with_a_note_naming_what_differs(tmp_path, capsys):
    mod = _module()
    into = tmp_path / "sweeps"
    have = _sweep(into, "sw", ["m.0__a"])
    prov = json.loads((have / "provenance.json").read_text())
    (have / "provenance.json").write_text(json.dumps(dict(prov, config={"name": "sw", "batch_sizes": [1]})))
    res = _sweep(tmp_path / "res", "sw", ["m.0__a", "m.0__b"],
                 invocations=prov["invocations"] + [{"engines": [{"method": "none"}], "cells_done": 1}])
    prov2 = json.loads((res / "provenance.json").read_text())
    (res / "provenance.json").write_text(json.dumps(dict(prov2, config={"name": "sw", "batch_sizes": [1, 32]})))
    assert mod.main([str(res.parent), "--into", str(into)]) == 0
    assert "another config than the committed one (batch_sizes differ)" in capsys.readouterr().out
    assert mod.config_changes({"a": 1}, {"a": 1}) == [] and mod.config_changes({"a": 1}, None) == ["a"]
