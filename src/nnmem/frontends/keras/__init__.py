"""The Keras 3 frontend: one step definition, one module per backend (torch, jax, tensorflow)."""
