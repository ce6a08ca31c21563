"""``python -m course_lib.train``: see ``course_lib/train/trainer.py``."""

import sys

from course_lib.train.trainer import main

sys.exit(main())
