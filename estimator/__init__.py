"""Estimator: pure models of memory, speed and Cells, and the service that answers them."""
