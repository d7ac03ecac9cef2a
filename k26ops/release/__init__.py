"""The release build: what goes into an engine release, decided on the control node.

- `recipe`: the production recipe (pinned engine commit, wheels, patch series,
  engine profile) and its checks;
- `engine_source`, `enginelock`: the engine's source at one pinned commit and
  the lock of everything installed with it;
- `wheelhouse`, `wheelsource`: the release's wheels, and how hosts get them
  (pushed, from a peer relay, or an index);
- `patchset`: our patch series, applied and verified (also shipped to the host
  inside the release, where it verifies the installed files);
- `engine_flags`, `launch_rules`: the engine's command line and the launch
  rules it must satisfy;
- `prepcache`: the control node's cache of prepared sources and wheels.

The host half (make the release directory, install, switch `current`) is the
`release` step in `k26ops/steps/release.py`.
"""
