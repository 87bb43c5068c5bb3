"""`python -m sglang.launch_pd`: a whole PD deployment (prefill + decode + router) on one machine."""

import sys

from sglang.srt.disaggregation.launch_pd import main

if __name__ == "__main__":
    sys.exit(main())
