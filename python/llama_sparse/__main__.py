"""`python -m llama_sparse`"""
import sys

from .cli import main

sys.exit(main())
