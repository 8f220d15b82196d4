import sys

from memvir.cli import main

sys.exit(main())
