"""The Keras jax backend: trace a step without allocating, and measure it for real."""
