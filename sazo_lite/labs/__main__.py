import sys

from sazo_lite.labs import main

sys.exit(main())
