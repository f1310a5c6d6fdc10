"""How the answer of each dialect that does not speak the policy's contract maps onto it."""
