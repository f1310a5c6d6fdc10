"""One writer per partition: the writer locks (one module per backend) and their fence."""
