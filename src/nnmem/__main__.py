"""python -m nnmem"""

from nnmem.cli import main

main()
