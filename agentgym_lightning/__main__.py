import sys

from agentgym_lightning.cli import main

sys.exit(main())
