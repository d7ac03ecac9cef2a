"""The CLI's commands, one module per command or group; shared options and renderers sit in k26ops.cli."""
