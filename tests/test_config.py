from pathlib import Path

import pytest

from sdlib.config import ConfigError, load_sweep, parse_sweep
from sdlib.paths import CONFIGS_DIR

BASE = {
    "name": "t",
    "models": [{"path": "@models/target", "name": "tgt"}],
    "methods": [{"name": "none"}, {"name": "ngram", "num_spec_tokens": 3},
                {"name": "draft_model", "model": "@models/draft"}],
    "workloads": [{"dataset": "sharegpt", "num_requests": 4}],
    "batch_sizes": [4, 1, 4],
}


def test_valid_config_product_and_order():
    s = parse_sweep(BASE)
    assert s.batch_sizes == [1, 4]  # sorted, deduplicated
    cells = s.cells()
    assert len(cells) == 1 * 3 * 1 * 2 * 1
    assert cells[0].method.name == "none"  # baseline first
    assert len({c.run_id for c in cells}) == len(cells)
    assert cells[0].run_id.startswith("tgt__none__sharegpt__bs1__r0__")


def test_run_id_stable_and_config_sensitive():
    a = parse_sweep(BASE).cells()[2].run_id
    assert a == parse_sweep(BASE).cells()[2].run_id
    changed = dict(BASE, workloads=[{"dataset": "sharegpt", "num_requests": 5}])
    assert a != parse_sweep(changed).cells()[2].run_id


def test_method_labels_and_spec_config():
    s = parse_sweep(BASE)
    labels = [m.label for m in s.methods]
    assert labels == ["none", "ngram-k3", "draft_model-k3"]
    assert s.methods[0].speculative_config() is None
    ng = s.methods[1].speculative_config()
    assert ng["method"] == "ngram" and ng["num_speculative_tokens"] == 3
    assert ng["prompt_lookup_min"] == 3 and ng["prompt_lookup_max"] == 7
    assert s.methods[2].k == 3 and s.methods[0].k == 0


@pytest.mark.parametrize("patch, field", [
    ({"methods": [{"name": "eagel"}]}, "methods.0.name"),
    ({"workloads": [{"dataset": "mmlu"}]}, "workloads.0.dataset"),
    ({"batch_sizes": [0]}, "batch_sizes"),
    ({"batch_mode": "open"}, "batch_mode"),
    ({"models": [{"path": "x", "dtype": "fp8"}]}, "models.0.dtype"),
    ({"methods": [{"name": "eagle"}]}, "methods.0"),
    ({"workloads": [{"dataset": "gsm8k", "num_requests": 0}]}, "workloads.0.num_requests"),
    ({"surprise": 1}, "surprise"),
])
def test_bad_values_fail_in_one_line_naming_the_field(patch, field):
    with pytest.raises(ConfigError) as e:
        parse_sweep({**BASE, **patch})
    msg = str(e.value)
    assert "\n" not in msg
    assert field in msg


def test_bad_method_lists_allowed_values():
    with pytest.raises(ConfigError) as e:
        parse_sweep({**BASE, "methods": [{"name": "eagel"}]})
    for m in ("none", "ngram", "eagle", "eagle3", "draft_model", "mtp"):
        assert m in str(e.value)


def test_duplicate_method_labels_rejected():
    with pytest.raises(ConfigError, match="duplicate"):
        parse_sweep({**BASE, "methods": [{"name": "ngram"}, {"name": "ngram"}]})


def test_options_pass_through_but_reserved_keys_rejected():
    s = parse_sweep({**BASE, "methods": [{"name": "ngram", "options": {"prompt_lookup_max": 4}}]})
    assert s.methods[0].speculative_config()["prompt_lookup_max"] == 4
    with pytest.raises(ConfigError, match="options"):
        parse_sweep({**BASE, "methods": [{"name": "ngram", "options": {"method": "eagle"}}]})


def _is_serving(p) -> bool:
    import yaml

    return "traffic" in (yaml.safe_load(p.read_text()) or {})  # a serving sweep (sdlib.serve.config)


def test_shipped_configs_validate():
    from sdlib.serve.config import load_serving

    sweeps = [p for p in sorted(CONFIGS_DIR.glob("*.yaml")) if not p.name.endswith(".papermill.yaml")]
    assert sweeps
    for p in sweeps:
        load_serving(p) if _is_serving(p) else load_sweep(p)


def test_papermill_files_name_a_shipped_config():
    import yaml

    files = sorted(CONFIGS_DIR.glob("*.papermill.yaml"))
    assert files
    for p in files:
        params = yaml.safe_load(p.read_text())
        if "SERVING_CONFIG" in params:  # notebook 08 (sdlib.serve)
            from sdlib.serve.config import load_serving

            load_serving(CONFIGS_DIR.parent / params["SERVING_CONFIG"])
        if params.get("SWEEP_CONFIG") is None:  # draws committed sweeps only (gpu_sweeps.papermill.yaml)
            continue
        assert (CONFIGS_DIR.parent / params["SWEEP_CONFIG"]).is_file(), p.name
        load_sweep(CONFIGS_DIR.parent / params["SWEEP_CONFIG"])


def test_extends_takes_the_other_files_keys_and_replaces_its_own(tmp_path):
    """``extends``: every top-level key of the other file (its relative paths against its own folder), those the
    file gives replacing them; a chain is followed; the twins for another card differ only in name."""
    import yaml

    (tmp_path / "prompts.jsonl").write_text('{"question": "1 + 1?"}\n')
    base = {"name": "base", "description": "on card A", "models": [{"name": "tiny", "path": "@models/target"}],
            "methods": [{"name": "none"}, {"name": "ngram", "num_spec_tokens": 3}],
            "workloads": [{"dataset": "gsm8k", "source": "local", "path": "prompts.jsonl", "num_requests": 1}],
            "batch_sizes": [1, 2]}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "twin.yaml").write_text("extends: ../base.yaml\nname: twin\ndescription: on card B\n")
    (tmp_path / "sub" / "small.yaml").write_text("extends: twin.yaml\nbatch_sizes: [1]\n")
    b, t, s = (load_sweep(tmp_path / f) for f in ("base.yaml", "sub/twin.yaml", "sub/small.yaml"))
    assert (t.name, t.description, s.name, s.batch_sizes) == ("twin", "on card B", "twin", [1])
    assert t.workloads == b.workloads and t.methods == b.methods and t.batch_sizes == b.batch_sizes
    assert Path(t.workloads[0].path).resolve() == (tmp_path / "prompts.jsonl").resolve()
    twins = sorted(CONFIGS_DIR.glob("h100_*.yaml"))
    assert twins
    for p in twins:
        h100 = load_sweep(p)
        h200 = load_sweep(p.with_name(p.name.replace("h100_", "h200_", 1)))
        assert h100.name == p.stem and [c.run_id for c in h100.cells()] != []
        assert {k: v for k, v in vars(h100).items() if k not in ("name", "description")} == \
            {k: v for k, v in vars(h200).items() if k not in ("name", "description")}, p.name


def test_missing_file():
    with pytest.raises(ConfigError, match="not found"):
        load_sweep("configs/does_not_exist.yaml")


@pytest.mark.parametrize("name", sorted(p.name for p in (CONFIGS_DIR.parent / "data" / "sweeps").iterdir() if p.is_dir()))
def test_every_committed_sweep_is_its_configs_cells(name):
    """Each committed sweep holds exactly its config's current cells, all done: a config or sdlib change that
    renames cells (a rerun would redo them, the notebooks would read nothing) fails here. Fix: `sdlib rekey`.
    A sweep still being added to across GPU sessions (its latest invocation ran a selection, which its provenance
    records as ``selection``, or was cut off before it finished) holds a subset: every cell it holds is still one
    of its config's. Invocations recorded before ``selection`` existed say it by their options."""
    import json

    from sdlib.store import SweepStore

    sweep = load_sweep(CONFIGS_DIR / f"{name}.yaml")
    want, done = {c.run_id for c in sweep.cells()}, SweepStore(sweep.out_dir).done_ids()
    last = json.loads((sweep.out_dir / "provenance.json").read_text())["invocations"][-1]
    before_selection = ("--plan-minutes", "--blocks", "--methods", "--datasets", "--batch-sizes")  # the options then
    selected = last.get("selection") or ("selection" not in last and any(a.split("=")[0] in before_selection
                                                                       for a in last["argv"]))
    if selected or "finished_at" not in last:
        assert done and done <= want, sorted(done - want)[:5]
    else:
        assert want == done


def test_committed_serving_sweep_cells_keep_their_run_ids():
    from sdlib.serve.config import load_serving

    cfg = load_serving(CONFIGS_DIR / "embedded_serving.yaml")
    assert set(cfg.run_ids()) == {p.stem for p in (cfg.out_dir / "serve_runs").glob("*.parquet")}


def test_committed_embedded_sweep_cells_keep_their_run_ids():
    """Adding config fields must not change the run ids of committed results (a rerun would redo them)."""
    from sdlib.store import SweepStore

    sweep = load_sweep(CONFIGS_DIR / "embedded_default.yaml")
    ids = {c.run_id for c in sweep.cells()}
    assert ids == SweepStore(sweep.out_dir).done_ids()


def test_method_filters_and_warmup_scope():
    s = parse_sweep({"name": "f", "models": [{"path": "/m"}],
                     "methods": [{"name": "none"}, {"name": "ngram", "datasets": ["gsm8k"], "batch_sizes": [4]}],
                     "workloads": [{"dataset": "gsm8k"}, {"dataset": "sharegpt"}], "batch_sizes": [1, 4],
                     "warmup_scope": "batch_size"})
    cells = s.cells()
    assert len([c for c in cells if c.method.name == "none"]) == 4
    ng = [c for c in cells if c.method.name == "ngram"]
    assert [(c.workload.dataset, c.batch_size) for c in ng] == [("gsm8k", 4)]
    assert all(c.warmup_scope == "batch_size" for c in cells) and "warmup_scope" in cells[0].key()
    with pytest.raises(ConfigError, match="datasets"):
        parse_sweep({"name": "f", "models": [{"path": "/m"}], "methods": [{"name": "ngram", "datasets": ["aime"]}],
                     "workloads": [{"dataset": "gsm8k"}], "batch_sizes": [1]})


def test_a_new_hub_revision_gets_new_run_ids(tmp_path, monkeypatch):
    """Hub ids carry the revision the local Hub cache resolved (refs/main), so a new revision of a hub model
    never reuses the old revision's cells; never fetched here: no fingerprint."""
    from sdlib.config import model_fingerprint

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    cfg = {"name": "hub", "models": [{"path": "org/model"}], "methods": [{"name": "none"}],
           "workloads": [{"dataset": "gsm8k"}], "batch_sizes": [1]}
    assert model_fingerprint("org/model") is None
    ids = []
    for rev in ("a" * 40, "b" * 40):
        ref = tmp_path / "models--org--model" / "refs" / "main"
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(rev)
        assert model_fingerprint("org/model") == f"hub@{rev[:12]}"
        ids.append(parse_sweep(cfg).cells()[0].run_id)
    assert ids[0] != ids[1]


def test_preflight_accepts_a_cached_hub_model_offline(tmp_path, monkeypatch):
    from sdlib.run.preflight import _check_model

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="unreachable"):
        _check_model("models.0.path", "org/model")
    (tmp_path / "models--org--model" / "refs").mkdir(parents=True)
    (tmp_path / "models--org--model" / "refs" / "main").write_text("c" * 40)
    assert _check_model("models.0.path", "org/model") is None


def test_shape_fingerprint_is_stable_while_another_process_writes_the_shape(tmp_path, monkeypatch):
    # the sweep's supervisor rewrote @shapes configs while a worker hashed them: the worker read a half-written
    # file, computed other run ids and refused its cells (H200, 2026-12-01)
    import threading

    from sdlib.models import shapes

    monkeypatch.setattr(shapes, "SHAPES_DIR", tmp_path)
    monkeypatch.setattr(shapes.write_shape, "__defaults__", (tmp_path,))
    d = shapes.write_shape("llama-3.1-8b")
    before = {f.name: f.stat().st_mtime_ns for f in d.iterdir()}
    stop = threading.Event()

    def writer():
        while not stop.is_set():
            shapes.write_shape("llama-3.1-8b")

    t = threading.Thread(target=writer)
    t.start()
    try:
        from sdlib.config import _folder_fingerprint

        seen = {_folder_fingerprint(str(d), i) for i in range(300)}
    finally:
        stop.set()
        t.join()
    assert len(seen) == 1
    assert {f.name: f.stat().st_mtime_ns for f in d.iterdir()} == before  # same text: nothing rewritten


# ---------------------------------------------------------------------------
# the powered design: engine starts, interleaved (A B B A) order, A/A twins
# ---------------------------------------------------------------------------
POWERED = {"name": "p", "models": [{"path": "/m", "name": "m"}],
           "workloads": [{"dataset": "gsm8k", "source": "reference", "full_traces": True}],
           "batch_sizes": [1, 8], "engine": {"pin_target": True},
           "methods": [{"name": "none"}, {"name": "eagle3", "model": "/h", "replay": "fixed"},
                       {"name": "eagle3", "model": "/h", "replay": "combine"},
                       {"name": "eagle3", "model": "/h", "replay": "fixed", "label": "eagle3-k3-fixed-AA",
                        "aa_of": "eagle3-k3-fixed"}]}


def test_engine_starts_give_each_engine_its_own_cells_and_run_ids():
    one = parse_sweep({**POWERED, "engine_starts": 1})
    two = parse_sweep({**POWERED, "engine_starts": 2})
    assert len(two.cells()) == 2 * len(one.cells())
    # start 0 keeps the run ids a sweep without engine_starts had; start 1 cells are new ones, marked s1
    assert [c.run_id for c in two.cells() if c.start == 0] == [c.run_id for c in one.cells()]
    assert all("__r0s1__" in c.run_id for c in two.cells() if c.start == 1)
    assert {c.group for c in two.cells()} == {("m", "none", 0), ("m", "eagle3-k3", 0), ("m", "none", 1),
                                             ("m", "eagle3-k3", 1)}  # the A/A twin shares its arm's engine


def test_abba_order_interleaves_arms_and_reverses_engines_on_odd_starts():
    s = parse_sweep({**POWERED, "engine_starts": 2, "repeats": 2, "order": "abba"})
    cells = s.cells()
    groups = list(dict.fromkeys(c.group for c in cells))
    assert groups == [("m", "none", 0), ("m", "eagle3-k3", 0), ("m", "eagle3-k3", 1), ("m", "none", 1)]
    block = [(c.method.label, c.repeat) for c in cells if c.group == ("m", "eagle3-k3", 0) and c.batch_size == 1]
    assert block == [("eagle3-k3-fixed", 0), ("eagle3-k3-combine", 0), ("eagle3-k3-fixed-AA", 0),
                     ("eagle3-k3-fixed-AA", 1), ("eagle3-k3-combine", 1), ("eagle3-k3-fixed", 1)]
    assert sorted(c.run_id for c in cells) == sorted(c.run_id for c in parse_sweep(
        {**POWERED, "engine_starts": 2, "repeats": 2}).cells())  # the order changes no cell
    with pytest.raises(ConfigError, match="even number of runs per arm"):
        parse_sweep({**POWERED, "order": "abba"})
    # one repeat on two engine starts: the second start runs each block's arms backward
    s2 = parse_sweep({**POWERED, "engine_starts": 2, "order": "abba"})
    second = [c.method.label for c in s2.cells() if c.group == ("m", "eagle3-k3", 1) and c.batch_size == 1]
    assert second == ["eagle3-k3-fixed-AA", "eagle3-k3-combine", "eagle3-k3-fixed"]


def test_an_aa_twin_must_equal_its_arm():
    bad = [dict(m) for m in POWERED["methods"]]
    bad[3]["num_spec_tokens"] = 5
    with pytest.raises(ConfigError, match="differs in"):
        parse_sweep({**POWERED, "methods": bad})
    bad[3] = {**POWERED["methods"][3], "aa_of": "nope"}
    with pytest.raises(ConfigError, match="aa_of"):
        parse_sweep({**POWERED, "methods": bad})


def test_a_workloads_batch_sizes_select_cells_and_keep_their_ids():
    """``workloads.*.batch_sizes`` runs a workload at some batch sizes only; the cells it keeps have the ids they
    have without it, so widening it later keeps the cells run. A batch size outside the sweep's is an error."""
    base = load_sweep(CONFIGS_DIR / "h200_powered_ngram.yaml").to_dict()
    for w in base["workloads"]:
        w.pop("batch_sizes", None)
    full = {c.run_id for c in parse_sweep(base).cells()}
    narrow = dict(base, workloads=[{**base["workloads"][0], "batch_sizes": [32]}, *base["workloads"][1:]])
    sel = parse_sweep(narrow).cells()
    assert {c.run_id for c in sel} < full
    assert {c.batch_size for c in sel if c.workload.label == "instructcoder"} == {32}
    assert {c.batch_size for c in sel if c.workload.label == "gsm8k"} == {32, 128}
    with pytest.raises(ConfigError, match=r"workloads.instructcoder.batch_sizes: \[8\]"):
        parse_sweep(dict(base, workloads=[{**base["workloads"][0], "batch_sizes": [8]}]))


def test_run_ids_of_shape_models_are_computed_without_writing_files(tmp_path, monkeypatch):
    """A cell's run id hashes a shape's files as they would be written, and writes nothing (the race of f7bdbf8);
    the hash equals that of the folder written for an engine."""
    import sdlib.config as C
    from sdlib.models import shapes

    monkeypatch.setattr(shapes, "SHAPES_DIR", tmp_path / "shapes")
    written = []
    monkeypatch.setattr(shapes, "write_shape", lambda *a, **k: written.append(a))
    ids = [c.run_id for c in load_sweep(CONFIGS_DIR / "h200_powered_ngram.yaml").cells()]
    assert ids and not written and not (tmp_path / "shapes").exists()
    monkeypatch.undo()
    d = shapes.write_shape("llama-3.1-8b", tmp_path / "written")
    assert C._folder_fingerprint(str(d), 0.0) == C.model_fingerprint("@shapes/llama-3.1-8b")


def test_a_config_recorded_before_fields_were_added_is_not_rewritten(tmp_path):
    """A sweep that runs nothing records its config as current; when the recorded config reads as the same one
    today (it only lacks fields added since, at their defaults), provenance.json keeps it, so a fresh clone's
    `make figures` leaves the committed file as it is."""
    from sdlib.run.sweep import recorded_form
    from sdlib.store import SweepStore

    sweep = load_sweep(CONFIGS_DIR / "embedded_default.yaml")
    old = sweep.to_dict()
    old.pop("engine_starts", None)
    for m in old["methods"]:
        m.pop("aa_of", None)
    store = SweepStore(tmp_path / "s")
    store.set_current(old, [c.run_id for c in sweep.cells()])
    assert recorded_form(sweep, store) == old
    changed = dict(old, seed=old["seed"] + 1)
    store.set_current(changed, [])
    assert recorded_form(sweep, store) == sweep.to_dict()  # another config: the current one is recorded


def test_the_worker_writes_the_shapes_its_engine_loads(tmp_path, monkeypatch):
    """Run ids no longer write shape folders, so the worker writes the ones its engine loads on its own host (a
    Ray task may run where the supervisor's preflight did not)."""
    from sdlib.models import shapes
    from sdlib.run import worker

    written = []
    monkeypatch.setattr(worker, "write_shape", written.append)
    worker.write_shapes(load_sweep(CONFIGS_DIR / "h200_replay.yaml"))
    assert sorted(written) == ["eagle3-llama-3.1-8b", "llama-3.1-8b"] and set(written) <= set(shapes.SHAPES)
