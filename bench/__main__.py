"""``python -m bench`` runs the core benchmark (same options as ``python -m bench.core``)."""
from bench.core import main

raise SystemExit(main())
