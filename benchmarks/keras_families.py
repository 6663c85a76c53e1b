"""Randomized Keras 3 accuracy suite: nnmem's estimate against a real measurement on drawn small Keras models.

Run:  python benchmarks/keras_families.py [--seed 0] [--cases 40] [--keras torch,jax,tensorflow]
      [--families conv2d,rnn] [--runs 1] [--json out.json]

Each case is a small Keras model drawn from one op family (benchmarks/keras_builders.py) with a drawn head and
loss, compiled with a drawn optimizer, at a drawn batch (1 and odd sizes included) and mode (one
``train_on_batch`` step, or ``predict_on_batch``), all from ``--seed`` and the same on every backend. Each backend
runs in its own process (Keras fixes its backend at import); the model object is passed to ``nnmem.estimate``
and ``nnmem.measure`` as users pass it. The table gives the estimated and measured peaks (allocator level) and the
signed error; a failure is shown with its error and whether plain Keras runs the step; a case whose estimate
notes a kernel path that no rule models is marked and left out of the shares.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from keras_builders import FAMILIES, LOSSES, OPTIMIZERS  # benchmarks/ is the script's directory, on sys.path

from nnmem._api import MODES

BACKENDS = ("torch", "jax", "tensorflow")
BANDS = (0.02, 0.10)  # the shares reported: |error| within 2 %, 10 %
TRAIN_SHARE = 0.6
MARK = "@@case "  # a worker's result line on stdout (Keras and TensorFlow may print there too)


@dataclass(frozen=True, slots=True)
class Case:
    """One drawn configuration; ``seed`` draws the model, its weights and its data within the family."""

    index: int
    family: str
    seed: int
    batch: int
    mode: str
    optimizer: str
    loss: str

    @property
    def label(self) -> str:
        return f"{self.index}-{self.family}-b{self.batch}-{self.mode}-{self.optimizer}-{LOSSES[self.loss][1]}"


def draw(seed: int, count: int, families: Sequence[str] | None = None) -> list[Case]:
    """The first ``count`` cases of ``seed``'s draw over ``families`` (default: all): rounds of every family in a
    drawn order, so that a short run still covers each family."""
    names = list(families or FAMILIES)
    rng = random.Random(seed)
    cases: list[Case] = []
    order: list[str] = []
    for index in range(count):
        if not order:
            order = rng.sample(names, len(names))
        family = order.pop()
        case_seed, batch = rng.getrandbits(31), rng.choice(FAMILIES[family].batches)
        mode = MODES[0] if rng.random() < TRAIN_SHARE else MODES[1]
        optimizer, loss = rng.choice(OPTIMIZERS), rng.choice(sorted(LOSSES))  # compiled in inference too
        cases.append(Case(index, family, case_seed, batch, mode, optimizer, loss))
    return cases


@dataclass(frozen=True, slots=True)
class Result:
    """What one case gave on one backend: both peaks (allocator level, in bytes), or what stopped it."""

    backend: str
    case: Case
    config: str
    estimated: int | None
    measured: int | None
    peak_range: tuple[int, int] | None  # the estimate's (lowest, highest) peak where the op order varies
    failures: tuple[str, ...]  # what raised: "build: ...", "estimate: ...", "measure: ..."; () when both ran
    plain: str  # after a failure: "runs" or the error of the plain Keras step; "" otherwise
    unmodelled: str  # the estimate's "not modelled" notes, "" when none
    seconds: float

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Result:
        rng = data["peak_range"]
        return cls(**{**data, "case": Case(**data["case"]), "failures": tuple(data["failures"]),
                      "peak_range": tuple(rng) if rng else None})

    @property
    def error(self) -> str:
        return "; ".join(self.failures)

    @property
    def err(self) -> float | None:
        """Signed relative error of the estimate; None when the case failed."""
        if self.estimated is None or self.measured is None:
            return None
        return (self.estimated - self.measured) / self.measured if self.measured else float(self.estimated != 0)

    @property
    def inside(self) -> bool | None:
        """Whether the measured peak lies in the estimate's range; None without a range."""
        if self.peak_range is None or self.measured is None:
            return None
        return self.peak_range[0] <= self.measured <= self.peak_range[1]

    @property
    def scored(self) -> bool:
        return not self.error and not self.unmodelled

    def badness(self) -> float:
        """Sort key, worst first: failures, then |error|; noted cases last."""
        if self.error:
            return float("inf")
        return abs(self.err or 0.0) - (10.0 if self.unmodelled else 0.0)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]


# --- the worker: one backend, in its own process -----------------------------------------------------------

def run_case(case: Case, backend: str, timeout_s: float, runs: int) -> Result:
    """Estimate and measure one case on this process's Keras backend; an exception is recorded, not raised."""
    import keras
    from keras_builders import assemble

    import nnmem

    start = time.perf_counter()
    keras.backend.clear_session()
    try:
        built = assemble(case.family, case.seed, case.batch, case.optimizer, case.loss)
    except Exception as err:  # a builder bug: shown as a failure all the same
        return Result(backend, case, "", None, None, None, (f"build: {_first_line(err)}",), "", "",
                      time.perf_counter() - start)
    target = built.y if case.mode == "train" else None
    est = meas = peak_range = None
    failures, unmodelled = [], ""
    try:
        report = nnmem.estimate(built.model, built.x, target=target, mode=case.mode)
        est, peak_range = int(report.peak_bytes), report.peak_range
        unmodelled = "; ".join(n for n in report.notes if "not modelled" in n)
    except Exception as err:
        failures.append(f"estimate: {_first_line(err)}")
    try:
        report = nnmem.measure(built.model, built.x, target=target, mode=case.mode, timeout_s=timeout_s, runs=runs)
        meas = int(report.peak_bytes)
    except Exception as err:
        failures.append(f"measure: {_first_line(err)}")
    plain = plain_check(case, backend, timeout_s) if failures else ""
    return Result(backend, case, built.config, est, meas, peak_range, tuple(failures), plain, unmodelled,
                  time.perf_counter() - start)


def plain_check(case: Case, backend: str, timeout_s: float) -> str:
    """Whether plain Keras runs the case's step (``train_on_batch`` / ``predict_on_batch``) on ``backend``: "runs",
    or its error. In a fresh process: a step that crashes the framework must not take the worker with it."""
    args = [sys.executable, __file__, "--plain", json.dumps(asdict(case))]
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2"}
    try:
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"plain Keras step did not finish in {timeout_s:.0f} s"
    if done.returncode == 0:
        return "runs"
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    return lines[-1][len(MARK):] if lines else f"the plain Keras step killed its process (exit {done.returncode})"


def plain_step(case: Case) -> int:
    """Run the case's step with plain Keras in this process; print its error and return 1 when it raises."""
    from keras_builders import assemble

    try:
        built = assemble(case.family, case.seed, case.batch, case.optimizer, case.loss)
        if case.mode == "train":
            built.model.train_on_batch(built.x, built.y)
        else:
            built.model.predict_on_batch(built.x)
    except Exception as err:
        print(MARK + _first_line(err), flush=True)
        return 1
    return 0


def worker(backend: str, cases: Sequence[Case], timeout_s: float, runs: int) -> None:
    """Run ``cases`` on this process's backend, one result line (``MARK`` + JSON) each on stdout."""
    warnings.simplefilter("ignore")  # the drawn configurations' deprecation and fallback notices
    for case in cases:
        print(MARK + json.dumps(asdict(run_case(case, backend, timeout_s, runs))), flush=True)


# --- the parent: one worker process per backend ------------------------------------------------------------

def run_backend(backend: str, cases: Sequence[Case], argv: list[str]) -> list[Result]:
    """Every case on ``backend``, in worker processes; a worker that dies fails its case and the next one goes on."""
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2"}
    results: list[Result] = []
    start = 0
    while start < len(cases):
        proc = subprocess.Popen([sys.executable, __file__, *argv, "--worker", backend, "--start", str(start)],
                                env=env, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            if not line.startswith(MARK):
                continue
            r = Result.from_dict(json.loads(line[len(MARK):]))
            results.append(r)
            start = r.case.index + 1
            print(f"  [{backend} {start}/{len(cases)}] {r.case.label} {r.seconds:.1f}s {_pct(r.err)}"
                  f"{' ' + r.error if r.error else ''}{' (not modelled)' if r.unmodelled else ''}",
                  file=sys.stderr, flush=True)
        code = proc.wait()
        if start < len(cases):  # the worker died on cases[start]
            results.append(Result(backend, cases[start], "", None, None, None,
                                  (f"worker: the {backend} process died on this case (exit {code})",), "", "", 0.0))
            start += 1
    return results


# --- presentation ------------------------------------------------------------------------------------------

def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:+.2%}"


def _num(x: int | None) -> str:
    return "—" if x is None else f"{x:,}"


def _range(r: Result) -> str:
    return "" if r.inside is None else "in" if r.inside else "OUT"


def shares(rows: Sequence[Result]) -> dict[str, Any]:
    """Counts, the share of scored cases within each band, the median and max |error|."""
    scored = [r for r in rows if r.scored]
    errs = [abs(r.err or 0.0) for r in scored]
    ranged = [r for r in scored if r.inside is not None]
    return {"cases": len(rows), "scored": len(scored), "failed": sum(bool(r.error) for r in rows),
            "failed_in_plain_keras_too": sum(bool(r.error) and r.plain not in ("", "runs") for r in rows),
            "unmodelled": sum(bool(r.unmodelled) and not r.error for r in rows),
            **{f"within_{band:.0%}": (sum(e <= band for e in errs) / len(errs) if errs else None) for band in BANDS},
            "median": statistics.median(errs) if errs else None, "max": max(errs) if errs else None,
            "ranged": len(ranged), "inside_range": sum(bool(r.inside) for r in ranged)}


def summarize(results: Sequence[Result]) -> dict[str, Any]:
    """Per backend: the shares over all its cases and per family (the family with the worst case first)."""
    out: dict[str, Any] = {}
    for backend in dict.fromkeys(r.backend for r in results):
        rows = [r for r in results if r.backend == backend]
        families = sorted({r.case.family for r in rows},
                          key=lambda f: -max(r.badness() for r in rows if r.case.family == f))
        out[backend] = {**shares(rows), "families": {f: shares([r for r in rows if r.case.family == f])
                                                     for f in families}}
    return out


def render_table(results: Sequence[Result]) -> str:
    """One row per case and backend, each backend's worst case first."""
    header = (f"{'backend':10s} {'#':>3s} {'family':14s} {'b':>2s} {'mode':5s} {'opt':7s} {'loss':10s} "
              f"{'estimated':>11s} {'measured':>11s} {'error':>8s} {'range':5s}  config")
    lines = [header, "-" * len(header)]
    for backend in dict.fromkeys(r.backend for r in results):
        for r in sorted((r for r in results if r.backend == backend), key=lambda r: -r.badness()):
            c = r.case
            lines.append(f"{backend:10s} {c.index:>3d} {c.family:14s} {c.batch:>2d} {c.mode:5s} {c.optimizer:7s} "
                         f"{LOSSES[c.loss][1]:10s} {_num(r.estimated):>11s} {_num(r.measured):>11s} "
                         f"{_pct(r.err):>8s} {_range(r):5s}  {r.config}")
            if r.error:
                lines.append(f"{'':10s} FAILED {r.error} [plain Keras: {r.plain or '-'}]")
            elif r.unmodelled:
                lines.append(f"{'':10s} [not modelled: out of the shares] {r.unmodelled}")
    return "\n".join(lines)


def render_summary(summary: dict[str, Any], seed: int) -> str:
    """Per backend, overall and per family: counts, shares within each band, median and max |error|."""
    def fmt(x: float | None, spec: str) -> str:
        return "—" if x is None else format(x, spec)

    def row(name: str, s: dict[str, Any]) -> str:
        cells = " ".join(f"{fmt(s[f'within_{b:.0%}'], '.0%'):>6s}" for b in BANDS)
        ranged = f"{s['inside_range']}/{s['ranged']}" if s["ranged"] else ""
        return (f"{name:16s} {s['cases']:>5d} {s['scored']:>6d} {s['failed']:>6d} {s['unmodelled']:>6d} {cells} "
                f"{fmt(s['median'], '.2%'):>8s} {fmt(s['max'], '.2%'):>8s} {ranged:>9s}")

    bands = " ".join(f"{'≤' + format(b, '.0%'):>6s}" for b in BANDS)
    head = (f"{'':16s} {'cases':>5s} {'scored':>6s} {'failed':>6s} {'noted':>6s} {bands} {'median':>8s} "
            f"{'max|err|':>8s} {'in range':>9s}")
    lines = [f"seed {seed}: share of scored cases (not failed, not noted) by |error|; median and max |error|"]
    for backend, s in summary.items():
        lines += ["", f"{backend} (failed where plain Keras fails too: {s['failed_in_plain_keras_too']})", head]
        lines += [row(f, fs) for f, fs in s["families"].items()]
        lines.append(row("ALL", s))
    return "\n".join(lines)


def render_totals(summary: dict[str, Any], seconds: dict[str, float]) -> str:
    """One line per backend: the shares within each band, the median and max |error| and the run time."""
    lines = []
    for backend, s in summary.items():
        within = ", ".join(f"{'—' if s[f'within_{b:.0%}'] is None else format(s[f'within_{b:.0%}'], '.0%')} "
                           f"within {b:.0%}" for b in BANDS)
        median, top = ("—" if s[k] is None else f"{s[k]:.2%}" for k in ("median", "max"))
        lines.append(f"{backend}: {s['cases']} cases, {s['scored']} scored, {s['failed']} failed, "
                     f"{s['unmodelled']} noted; {within}; median |error| {median}, max {top}; "
                     f"{seconds[backend]:.0f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seed", type=int, default=None, help="draw seed (default: a random one, printed)")
    parser.add_argument("--cases", type=int, default=40, help="cases per backend")
    parser.add_argument("--families", help=f"comma-separated subset of: {', '.join(FAMILIES)}")
    parser.add_argument("--keras", default=",".join(BACKENDS), help="Keras backends, each in its own process")
    parser.add_argument("--runs", type=int, default=1, help="fresh processes per measurement (nnmem.measure runs)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per measurement")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--plain", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.plain:
        return plain_step(Case(**json.loads(args.plain)))
    families = [f for f in args.families.split(",") if f] if args.families else None
    unknown = sorted(set(families or ()) - set(FAMILIES))
    if unknown:
        parser.error(f"unknown families {', '.join(unknown)}: expected some of {', '.join(FAMILIES)}")
    backends = [b for b in args.keras.split(",") if b]
    if not backends or set(backends) - set(BACKENDS):
        parser.error(f"expected --keras as some of {', '.join(BACKENDS)}. Received: {args.keras!r}")
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    cases = draw(seed, args.cases, families)
    if args.worker:
        worker(args.worker, cases[args.start:], args.timeout, args.runs)
        return 0
    print(f"seed {seed}, {len(cases)} cases per backend, backends {', '.join(backends)}", flush=True)
    forward = ["--seed", str(seed), "--cases", str(args.cases), "--timeout", str(args.timeout),
               "--runs", str(args.runs), *(["--families", ",".join(families)] if families else [])]
    results: list[Result] = []
    seconds: dict[str, float] = {}
    for backend in backends:
        t0 = time.perf_counter()
        results += run_backend(backend, cases, forward)
        seconds[backend] = time.perf_counter() - t0
    summary = summarize(results)
    print(render_table(results))
    print()
    print(render_summary(summary, seed))
    print()
    print(render_totals(summary, seconds))
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"seed": seed, "summary": summary, "seconds": seconds,
                       "cases": [{**asdict(r), "err": r.err} for r in results]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
