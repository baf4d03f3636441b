import sys

from corral.server.migrations import main

sys.exit(main())
