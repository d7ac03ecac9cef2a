"""The model's weights as part of the release (issue 44).

- `manifest`: the model manifest (one line per file: sha256, size, path), made from
  the Hub (huggingface_hub's list_repo_tree) or from a reference copy, its hash;
  the fast comparison of a host's file listing with it (sizes and the file set).
- `plan`: who fetches which shard from whom (the origin once per site, then peers).
- `hostops`: the host side (verify, fetch) driven through the `weights` agent.
- `sync`: `k26ops model sync` over the fleet.

How-to: docs/how-to/weights-sync.md.
"""
