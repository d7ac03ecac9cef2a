"""Every module that declares the inventory variables it reads (k26ops.hostvars),
imported here so the registry is whole before the CLI loads an inventory or prints
the variables' table. The CLI is the layer that may import them all; the registry
itself sits in the base layer, where every reader can declare into it.

tests/inventory/test_inventory_vars.py holds this list to the modules that call `declare`.
"""

from k26ops import inventory, layout  # noqa: F401 (declarations)
from k26ops.engine import host as enginehost  # noqa: F401 (declarations)
from k26ops.engine import multinode, profile  # noqa: F401 (declarations)
from k26ops.host import preflight  # noqa: F401 (declarations)
from k26ops.inventory import fields, variables  # noqa: F401 (declarations)
from k26ops.release import installer, wheelsource  # noqa: F401 (declarations)
from k26ops.selftest import run as selftest_run  # noqa: F401 (declarations)
from k26ops.steps import driver, engine, gateway_spec, toolchain  # noqa: F401 (declarations)
from k26ops.traffic import drain  # noqa: F401 (declarations)
from k26ops.weights import sync  # noqa: F401 (declarations)
