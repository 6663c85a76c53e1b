"""Models of the frameworks' allocators: tensor level → allocator level → reserved level.

``cuda_caching`` models PyTorch's CUDACachingAllocator; ``bfc`` models TensorFlow's BFC allocator.
"""
