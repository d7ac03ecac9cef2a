"""`k26ops rehearse`: fire the release's own engine, with the unit's command
line, on dummy weights, before any real model load.

What depends on the engine build, its flags and its graph shapes (CUDA-graph
capture, the speculative verify path, a None field or a shape mismatch on the
first request) shows in minutes instead of after a 390 s load of 590 GB.

- `plan`: pure: the unit's argv rewritten for a rehearsal (dummy weights,
  private port, memory fraction, tokenizer skipped), the model and drafter
  configs fitted to fewer layers, the engine log's capture times.
- `run`: one host's rehearsal through the `rehearse` host agent: start, the
  deploy's own ready-wait, smoke (token ids), a short bench through k26ops'
  load generator, stop and clean up whatever happened.
"""
