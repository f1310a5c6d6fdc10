"""What may be spent: budget reservations, shared limits, estimates, deadline plans."""
