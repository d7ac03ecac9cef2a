"""Every step a playbook may name, in one explicit table (nothing registers
itself by being imported). The baselines' own steps are not here: only a
rollback runs them (k26ops.baselines.rollback.steps)."""

from __future__ import annotations

from k26ops.steps import Step
from k26ops.steps.driver import Driver
from k26ops.steps.engine import HealthStep, ServiceStep, SmokeStep
from k26ops.steps.gateway import GatewayHealth, GatewayRelease, GatewayService, GatewayWorkers
from k26ops.steps.release import Release
from k26ops.steps.toolchain import CudaToolkit
from k26ops.steps.traffic import TrafficStep

STEPS: dict[str, type[Step]] = {
    cls.name: cls
    for cls in (
        CudaToolkit,
        Driver,
        Release,
        ServiceStep,
        HealthStep,
        SmokeStep,
        TrafficStep,
        GatewayRelease,
        GatewayService,
        GatewayHealth,
        GatewayWorkers,
    )
}
