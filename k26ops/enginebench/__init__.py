"""The engine's own speed and acceptance, measured on each host (`k26ops bench`),
stored with baselines and compared with them (`bench --compare`, the canary
gate of `deploy --gate`).

- `loadgen.py`: the host-side agent (stdlib): runs `sglang.bench_serving` from
  the release venv when it imports, else k26ops' own load generator with the
  same metric definitions.
- `run.py`: what to run (BenchSpec), one host's bench, medians over runs.
- `figures.py`: figure names, comparing with a baseline, the gate's verdict.
- `stored.py`: the bench results a baseline holds.
- `gate.py`: the deploy step that benches a canary and rolls it back on a regression.
"""
