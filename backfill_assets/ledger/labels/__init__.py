"""The accepted labels once booked: applied, re-labelled from stored answers, exported."""
