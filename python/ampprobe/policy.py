"""ampprobe.policy - the precision policy a job obeys, from the environment
(no torch needed). `ampprobe bisect -- CMD` drives a job it did not write
through exactly these variables:

  AMPPROBE_FP32       modules forced to FP32: comma-separated kind names
                      (linear, bn, layernorm, revin, activation, softmax,
                      attention, loss, conv, embedding, ...), fnmatch globs
                      on module names ("enc.bn*") or =NAME, the one module
                      named exactly NAME (never a kind, never a glob:
                      "=bn", "=enc[0]"; bisect --granularity layer names
                      modules this way), as `--fp32`;
  AMPPROBE_PRECISION  "fp32" runs the whole job in FP32 (also fp16, bf16:
                      overrides the job's own choice);
  AMPPROBE_TRACE      the path the trace goes to (overrides the job's);
  AMPPROBE_SEED       the seed to use (bisect's second FP32 baseline measures
                      seed-to-seed noise with it): env_seed(default).
"""
import fnmatch
import os

ENV_FP32 = "AMPPROBE_FP32"
ENV_PRECISION = "AMPPROBE_PRECISION"
ENV_TRACE = "AMPPROBE_TRACE"
ENV_SEED = "AMPPROBE_SEED"


def env_seed(default, environ=None):
    """$AMPPROBE_SEED as an int when set, else default."""
    env = os.environ if environ is None else environ
    v = env.get(ENV_SEED)
    if not v:
        return default
    try:
        return int(v)
    except ValueError:
        raise ValueError("%s=%r: expected an integer" % (ENV_SEED, v))

# An fp32 entry that starts with this is one module's exact name
# (PROBE_POLICY_LITERAL of ampprobe/trainer.h).
LITERAL = "="

# The kind vocabulary of probe.h, for telling kinds from globs without
# loading the library. Kept in step with PROBE_KIND_MAP by a test.
KINDS = ("input", "linear", "bn", "layernorm", "revin", "activation",
         "softmax", "attention", "loss", "other", "conv", "embedding")


def split_list(text):
    if text is None:
        return []
    if isinstance(text, (list, tuple, set)):
        items = []
        for t in text:
            items.extend(split_list(t))
        return items
    return [t.strip() for t in str(text).split(",") if t.strip()]


class Policy:
    """Which modules run in FP32, the job's precision, and the trace path.
    fp32 entries are kind names, name globs or =NAME (one module, its name
    exactly)."""

    def __init__(self, fp32=(), precision=None, trace=None,
                 precision_from="precision"):
        """precision_from: where precision came from, named by its error
        (the argument, or ENV_PRECISION when the environment set it)."""
        self.fp32 = split_list(fp32)
        self.precision = precision
        self.trace = trace
        bad = [p for p in ([precision] if precision else [])
               if p not in ("fp32", "fp16", "bf16")]
        if bad:
            raise ValueError("%s=%r: expected fp32, fp16 or bf16" %
                             (precision_from, bad[0]))
        if LITERAL in self.fp32:
            raise ValueError("fp32 entry %r names no module (=NAME is the "
                             "module named exactly NAME)" % LITERAL)

    @classmethod
    def from_env(cls, environ=None, fp32=(), precision=None, trace=None):
        """The job's own settings, overridden by the environment's."""
        env = os.environ if environ is None else environ
        f = env.get(ENV_FP32)
        p = env.get(ENV_PRECISION) or None
        t = env.get(ENV_TRACE) or None
        return cls(fp32=split_list(fp32) + split_list(f),
                   precision=p or precision, trace=t or trace,
                   precision_from=ENV_PRECISION if p else "precision")

    def forces_fp32(self, name, kind):
        """True when a module (its dotted name and kind name) must run in
        FP32: the whole job is FP32, its kind is listed, a glob matches its
        name, or =NAME names it exactly."""
        if self.precision == "fp32":
            return True
        for p in self.fp32:
            if p.startswith(LITERAL):
                if p[len(LITERAL):] == name:
                    return True
            elif p == kind or fnmatch.fnmatchcase(name, p):
                return True
        return False

    def describe(self, base):
        """Human-readable, as the trace's precision_policy: "fp16; fp32: bn"."""
        prec = self.precision or base
        s = prec
        if self.fp32 and prec != "fp32":
            s += "; fp32: " + ",".join(self.fp32)
        return s
