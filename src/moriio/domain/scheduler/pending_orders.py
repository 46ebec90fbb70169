"""Worker orders a scheduler book gathers during a step, taken once per step."""

from __future__ import annotations

from moriio.domain.params.orders import StepOrders


class PendingOrders:
    """Gathers this step's orders in ``_orders`` until :meth:`take_orders` takes them."""

    def __init__(self) -> None:
        self._orders = StepOrders()

    @property
    def has_orders(self) -> bool:
        """Whether orders wait for the next :meth:`take_orders`."""
        return not self._orders.is_empty()

    def take_orders(self) -> StepOrders:
        """This step's orders; resets them."""
        orders, self._orders = self._orders, StepOrders()
        return orders
