"""Every controller `egpu controller` runs: a controller joins by one entry (name -> factory).

The MIG adapter joins here the same way as the claims controller and the budget keeper.
"""

from __future__ import annotations

from elastic_gpu.controller.budget import BudgetKeeper
from elastic_gpu.controller.claims import ClaimController
from elastic_gpu.controller.manager import ControllerFactory

CONTROLLERS: dict[str, ControllerFactory] = {
    ClaimController.name: ClaimController,
    BudgetKeeper.name: BudgetKeeper,
}
