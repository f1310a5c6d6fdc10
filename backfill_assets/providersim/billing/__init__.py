"""What the simulator bills: its meter, prices, usage shapes and the organisation usage API."""
