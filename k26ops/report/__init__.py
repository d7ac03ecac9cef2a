"""`k26ops report`: one self-contained HTML page (inline SVG charts, no script,
no network) for a bench, a canary gate, a deploy or a comparison of two baselines.

- `model.py`: the stored data (a `--json` run document, a baseline's stored benches)
  turned into one view per host: the new bench beside the baseline's, the gate's
  verdict, the restart's phases, GPU health changes, the gateway's failed requests.
- `charts.py`: matplotlib figures written as SVG text.
- `page.py`: `build_html(view)`: the page, a pure function of the view.
"""
