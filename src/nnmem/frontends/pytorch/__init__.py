"""PyTorch frontend: trace a training or inference step under FakeTensorMode, or for real."""
