import sys

from sazo_lite.course.labs import main

sys.exit(main())
