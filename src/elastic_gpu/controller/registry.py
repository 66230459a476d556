"""Every controller `egpu controller` runs: a controller joins by one entry (name -> factory).

The claims controller, the MIG adapter, the budget keeper, the defragmentation controller and
the mig-dynamic controller each join by one entry.
"""

from __future__ import annotations

from elastic_gpu.controller.budget import BudgetKeeper
from elastic_gpu.controller.claims.controller import ClaimController
from elastic_gpu.controller.defrag.controller import DefragController
from elastic_gpu.controller.manager import ControllerFactory
from elastic_gpu.controller.mig.controller import MigController
from elastic_gpu.controller.mig.dynamic import MigDynamicController

CONTROLLERS: dict[str, ControllerFactory] = {
    ClaimController.name: ClaimController,
    MigController.name: MigController,
    BudgetKeeper.name: BudgetKeeper,
    DefragController.name: DefragController,
    MigDynamicController.name: MigDynamicController,
}
