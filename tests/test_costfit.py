import numpy as np
import pandas as pd
import pytest

from sdlib.sim.costfit import fit_joint


def test_joint_fit_recovers_known_coefficients():
    # steps generated from T = 2e-7*kv + 1.5e-5*n + 4e-3, drafting 7e-8*kv + 1.3e-3 on SD steps
    rng = np.random.default_rng(0)
    rows = []
    for sd in (0, 1):
        for b in (1, 8, 32, 128):
            kv = b * rng.uniform(100, 400, 50)
            n = b * (4 if sd else 1) + rng.integers(0, 3, 50)
            y = 2e-7 * kv + 1.5e-5 * n + 4e-3 + sd * (7e-8 * kv + 1.3e-3)
            rows.append(pd.DataFrame({"num_context_tokens": kv, "num_scheduled_tokens": n, "duration_s": y, "sd": sd}))
    d = pd.concat(rows)
    coef, meta = fit_joint(d[d.sd == 0], d[d.sd == 1])
    assert coef == pytest.approx([2e-7, 1.5e-5, 4e-3, 7e-8, 1.3e-3], rel=1e-6)
    assert meta["r2"] == pytest.approx(1.0)
