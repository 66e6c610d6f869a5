"""A script that prints a lot: its training throughput under ptdash against plain python.

The workload is a small MLP whose every step prints what chatty scripts print: a tqdm-like
bar redrawn with a carriage return (its postfix holds the loss and an accuracy), a log line
with the loss, and lines of a per-layer dump (numbers, no metric), with a dict of
validation metrics every 100 steps; ``--mb`` megabytes in all (200 by default). Each
variant runs as its own process, one after the other, in an order that turns each round
(interleaved in this one run of the benchmark, so the machine's load falls on all alike):

- ``plain``: ``python script.py > out.log`` (stdout and stderr on a file, block-buffered);
- ``piped``: ``python -u script.py 2>&1 | cat > out.log``: what ptdash does to the output
  without ptdash (unbuffered, as ``PYTHONUNBUFFERED=1``, which ptdash sets so that output
  streams as it is printed; through a pipe read by another process), as
  ``python -u train.py | tee log`` would; the fair baseline for the pipe's own cost;
- ``ptdash``: ``ptdash --headless script.py`` (output through the relay's pipe, read for
  metrics by its copier, a process of its own: engine/outproc.py; the steps marked in it:
  engine/outmarks.py; the headless front copying output.log to its stdout, a file here);
- ``no-parse``: the same with ``--no-parse-output``, which tells the parser's own share
  (no parse, no marks; the engine's own instrumentation of each step stays).

The script times its own loop (steps/s from its first to its last step, without the start
of the interpreter), so a ratio is throughput against plain: 1.00 is no cost, 0.95 is 5%
slower. It also checks what ptdash stored: every validation value, and how many are at
the step they were printed at (all of them: the output is marked, engine/outmarks.py). Last, the parser's
own CPU time over the same bytes, in this process: what it takes from the relay's copier
whatever the machine's load.

    OMP_NUM_THREADS=1 python benchmarks/printed_output.py [--mb 200] [--rounds 3] [--width 32]

``--width`` is the model's: 32 makes the flood (steps of a few hundred microseconds, 20 MB/s);
1024, steps of milliseconds printing the same, at a rate real scripts print at.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = r'''
import json, sys, time
import torch

target, result, width = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)])
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x, y = torch.randn(16, width), torch.randn(16, width)
dump = "".join(f"layer {i} weight mean {0.001 * i:.4f} std {0.98:.3f} shape [32, 32] grads ok\n" for i in range(96))
written, step, start, steps, val = 0, 0, None, 0, {}
while written < target:
    step += 1
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    if start is None:
        start = time.perf_counter()
    value = 1.0 / step
    bar = f"\r{step % 100:3d}%|#####     | {step % 100}/100 [00:01<00:02, 310.5it/s, loss={value:.4f}, acc=0.91]"
    line = f"step {step} | loss {value:.4f} | acc 0.91 | 0.5 ms/step\n"
    sys.stderr.write(bar)
    sys.stdout.write(line + dump)
    written += len(bar) + len(line) + len(dump)
    if step % 100 == 0:
        val[step] = 2.0 + step / 1e6  # one value a step: each found at the step it was stored
        sys.stderr.write("\n")
        print({"eval_loss": val[step], "eval_accuracy": 0.9, "epoch": step / 100}, flush=True)
        written += 60
    steps += 1
sys.stdout.flush()
sys.stderr.flush()
seconds = time.perf_counter() - start
with open(result, "w") as f:
    json.dump({"steps": steps, "seconds": seconds, "bytes": written, "val": val}, f)
'''


def run(variant: str, mb: float, work: Path, env: dict, width: int = 32) -> dict:
    """One run of the workload; its own figures (steps, seconds, bytes) and what was stored."""
    script, result = work / "chatty.py", work / f"result-{variant}.json"
    script.write_text(SCRIPT)
    target = str(int(mb * 1e6))
    run_dir = work / f"run-{variant}"
    if variant == "plain":
        with open(work / "plain.log", "wb") as out:
            proc = subprocess.run([sys.executable, str(script), target, str(result), str(width)],
                                  stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work, timeout=3600)
    elif variant == "piped":
        with open(work / "plain.log", "wb") as out:
            cat = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=out)
            proc = subprocess.run([sys.executable, "-u", str(script), target, str(result), str(width)],
                                  stdout=cat.stdin, stderr=subprocess.STDOUT, env=env, cwd=work, timeout=3600)
            cat.stdin.close()
            cat.wait()
    else:
        options = ["--no-parse-output"] if variant == "no-parse" else []
        with open(work / "front.log", "wb") as out:  # the headless front's copy of the output, and its lines
            proc = subprocess.run([sys.executable, "-m", "ptdash.tui.cli", "--headless", "--run-dir", str(run_dir),
                                   *options, str(script), target, str(result), str(width)], stdout=out,
                                  stderr=subprocess.STDOUT, env=env, cwd=work, timeout=3600)
    if proc.returncode != 0:
        said = b""
        for name in ("front.log", f"run-{variant}/engine.log"):
            if (work / name).exists():
                with open(work / name, "rb") as f:
                    f.seek(max(0, (work / name).stat().st_size - 3000))
                    said += f"\n--- {name}:\n".encode() + f.read()
        raise SystemExit(f"{variant} failed with exit code {proc.returncode}:{said.decode(errors='replace')}")
    (work / "front.log").unlink(missing_ok=True)
    figures = json.loads(result.read_text())
    figures["stored"] = _stored(run_dir) if variant == "ptdash" else None
    if run_dir.exists():
        figures["output_bytes"] = (run_dir / "output.log").stat().st_size
    (work / "plain.log").unlink(missing_ok=True)
    for path in run_dir.glob("output.log"):
        path.unlink()
    return figures


def _stored(run_dir: Path) -> dict:
    from ptdash.shared import names
    from ptdash.shared.reader import StoreReader

    with StoreReader(run_dir / "metrics.db") as reader:
        steps, values = reader.series(names.printed("eval_loss"))
        return {"eval_loss": dict(zip(steps, values)),
                "printed": sorted(n for n in reader.names() if names.parse_printed(n))}


def parser_cpu(mb: float) -> tuple[float, int]:
    """The parser's own CPU time (engine/printread.py) over the byte stream the workload prints,
    fed in the relay's 64 KB reads, in this process: seconds, and the values it found."""
    from ptdash.printed import PrintedMetrics

    step = [0]
    metrics = PrintedMetrics(lambda: step[0], lambda what, message, step=None: None)
    dump = "".join(f"layer {i} weight mean {0.001 * i:.4f} std {0.98:.3f} shape [32, 32] grads ok\n"
                   for i in range(96))
    pending, written, spent = bytearray(), 0, 0.0
    while written < mb * 1e6:
        step[0] += 1
        s, value = step[0], 1.0 / step[0]
        text = (f"\r{s % 100:3d}%|#####     | {s % 100}/100 [00:01<00:02, 310.5it/s, loss={value:.4f}, acc=0.91]"
                f"step {s} | loss {value:.4f} | acc 0.91 | 0.5 ms/step\n{dump}")
        if s % 100 == 0:
            text += "\n" + repr({"eval_loss": 2.0 + s / 1e6, "eval_accuracy": 0.9, "epoch": s / 100}) + "\n"
        data = text.encode()
        pending += data
        written += len(data)
        while len(pending) >= 1 << 16:
            chunk = bytes(pending[:1 << 16])
            del pending[:1 << 16]
            t0 = time.thread_time()
            metrics.feed(chunk)
            spent += time.thread_time() - t0
    t0 = time.thread_time()
    metrics.feed(bytes(pending))
    metrics.finish()
    spent += time.thread_time() - t0
    return spent, metrics.found


def marks_cost(steps: int = 20000, blocks: int = 8) -> tuple[float, float]:
    """What the step marks (engine/outmarks.py) cost a step that prints, on the training
    thread: each step writes one line through a line-buffered stream (a system call, as
    ``print(..., flush=True)``) into a pipe that ``cat`` drains, then its boundary as
    stepend.py has it; with marks, the stream's write is wrapped (the F mark before the
    step's first write) and the boundary writes the T mark: two more writes of 25 bytes.
    Blocks with and without, ABBA; the median of each: microseconds per step."""
    from ptdash.outmarks import Marks
    from ptdash.stepstate import StepState

    read, write = os.pipe()
    cat = subprocess.Popen(["cat"], stdin=read, stdout=subprocess.DEVNULL)
    os.close(read)
    stream = open(write, "w", buffering=1, closefd=False)
    line = "step 1 | loss 0.1234 | acc 0.91 | 0.5 ms/step\n"
    per: dict[bool, list[float]] = {False: [], True: []}
    for block in range(2 * blocks):
        on = block % 4 in (1, 2)
        state = StepState()
        marks = Marks(write, state, streams=lambda: (stream, stream)) if on else None
        t0 = time.perf_counter()
        for step in range(1, steps + 1):
            stream.write(line)
            if state.out_dirty:  # the boundary (stepend.py): one attribute test when nothing printed
                state.out_mark(step + 1)
            state.step = step + 1
        per[on].append((time.perf_counter() - t0) / steps * 1e6)
        if marks is not None:
            marks.close()
    stream.close()
    os.close(write)
    cat.wait()
    return statistics.median(per[False]), statistics.median(per[True])


def _lags(printed: dict[int, float], stored: dict[int, float]) -> list[int]:
    """For each value printed at a step, how many steps later it was stored (0: at its step;
    the relay runs behind a flood of output, and the marks in it say where each step's bytes are)."""
    by_value = {v: s for s, v in sorted(stored.items(), reverse=True)}
    lags = []
    for step, value in sorted(printed.items()):
        at = by_value.get(value)
        if at is None or at < step:
            raise SystemExit(f"the value printed at step {step} ({value}) was not stored at or after it")
        lags.append(at - step)
    return lags


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200.0, help="megabytes the script prints in each run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--width", type=int, default=32,
                        help="the model's width: 32 makes a flood (steps of a few hundred us); 512, steps of "
                             "milliseconds printing the same, at a rate real scripts print at")
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONWARNINGS": "ignore",
           "XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="ptd-bench-")}
    variants = ["plain", "piped", "ptdash", "no-parse"]
    rates: dict[str, list[float]] = {v: [] for v in variants}
    counts: dict[str, list[int]] = {v: [] for v in variants}
    load = [os.getloadavg()[0]]
    print(f"a script printing {args.mb:g} MB a run, {args.rounds} rounds, model width {args.width}, "
          f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}")
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for variant in order:
                work = Path(tmp) / f"{r}-{variant}"
                work.mkdir()
                t0 = time.monotonic()
                f = run(variant, args.mb, work, env, args.width)
                rate = f["steps"] / f["seconds"]
                rates[variant].append(rate)
                counts[variant].append(f["steps"])
                note = ""
                if f["stored"] is not None:
                    lags = _lags({int(k): v for k, v in f["val"].items()}, f["stored"]["eval_loss"])
                    exact = sum(1 for x in lags if not x)
                    note = (f"; all {len(lags)} eval_loss values stored, {exact} at the step printed"
                            + (f", the others at most {max(lags)} steps later" if exact < len(lags) else "")
                            + f"; series {', '.join(f['stored']['printed'])}")
                print(f"round {r + 1} {variant:>8}: {f['steps']:,} steps, {f['bytes'] / 1e6:.0f} MB printed, "
                      f"{rate:,.0f} steps/s ({time.monotonic() - t0:.0f} s wall){note}", flush=True)
                load.append(os.getloadavg()[0])
                shutil_rmtree(work)
    med = {v: statistics.median(rates[v]) for v in variants}
    print(f"median steps/s: plain {med['plain']:,.0f}, piped (-u | cat) {med['piped']:,.0f}, ptdash "
          f"{med['ptdash']:,.0f}, ptdash --no-parse-output {med['no-parse']:,.0f}")
    print(f"throughput ptdash/plain {med['ptdash'] / med['plain']:.3f}; ptdash/piped {med['ptdash'] / med['piped']:.3f};"
          f" piped/plain {med['piped'] / med['plain']:.3f}; --no-parse-output/piped "
          f"{med['no-parse'] / med['piped']:.3f}; the parser's share: ptdash/--no-parse-output "
          f"{med['ptdash'] / med['no-parse']:.3f}")
    pairs = [p / n for p, n in zip(rates["ptdash"], rates["no-parse"])]
    print(f"per round ptdash/--no-parse-output: {', '.join(f'{x:.3f}' for x in pairs)}; "
          f"load average {min(load):.1f}-{max(load):.1f}")
    plain_us, marked_us = marks_cost()
    print(f"the step marks on a step that prints one line (a write through a line-buffered stream into a pipe): "
          f"{plain_us:.2f} us a step without, {marked_us:.2f} us with: +{marked_us - plain_us:.2f} us "
          f"(the wrapper's call and two 25-byte writes)")
    spent, found = parser_cpu(args.mb)
    loop = statistics.median(steps / rate for steps, rate in zip(counts["plain"], rates["plain"]))
    print(f"the parser's own CPU over the same {args.mb:g} MB, in 64 KB reads: {spent:.2f} s ({found:,} values "
          f"found), {spent / args.mb * 1e3:.1f} ms per MB: {100 * spent / loop:.1f}% of the plain run's "
          f"{loop:.0f} s loop, in the relay's copier, not the training process")


def shutil_rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
