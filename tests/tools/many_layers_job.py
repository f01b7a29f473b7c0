"""tests/tools/many_layers_job.py - a stand-in job for `ampprobe bisect
--granularity layer` with more layers than one layer-level search takes:
NLAYERS linear layers (default 70, names l0..l69) written to $AMPPROBE_TRACE
through the ampprobe package's core Session (no PyTorch). The loss is NaN
from step 3 on unless layer l<CULPRIT> (default the last) runs in FP32
under the AMPPROBE_FP32 / AMPPROBE_PRECISION policy, so keeping the kind
`linear` in FP32 fixes it, and so does that one layer alone.
LAYERS="a|b|..." names the layers instead ("linear", "l[0]", "*": names a
bare --fp32 entry would read as a kind or a glob); CULPRIT is then a name."""
import os

import numpy as np

import ampprobe
from ampprobe.policy import Policy

n = int(os.environ.get("NLAYERS", "70"))
names = ["l%d" % i for i in range(n)]
culprit = "l%s" % os.environ.get("CULPRIT", str(n - 1))
if os.environ.get("LAYERS"):
    names = os.environ["LAYERS"].split("|")
    culprit = os.environ.get("CULPRIT", names[-1])
pol = Policy.from_env()
fixed = pol.forces_fp32(culprit, "linear")
rng = np.random.default_rng(ampprobe.env_seed(0))
with ampprobe.Session(pol.trace, mode="full", overwrite=True,
                      precision_policy=pol.describe("fp16")) as s:
    ids = [s.register(name, kind="linear",
                      precision="fp32" if pol.forces_fp32(name, "linear") else "fp16")
           for name in names]
    loss = 1.0
    for step in range(20):
        s.begin_step(step)
        x = rng.standard_normal(16).astype(np.float32)
        for i in ids:
            s.record(i, "fwd_out", x)
        loss = loss * 0.9 if fixed or step < 3 else float("nan")
        s.set_scalars(loss=loss, loss_scale=1.0, lr=1e-3)
        s.end_step()
