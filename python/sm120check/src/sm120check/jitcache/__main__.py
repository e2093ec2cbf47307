import sys

from sm120check.jitcache.cli import main

sys.exit(main())
