"""The Keras torch backend: trace a step without allocating, and measure it for real."""
