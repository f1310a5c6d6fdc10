"""Money: nano-dollars, prices, budgets, reconciliation, deadline plans (pure)."""
