"""A test double for tests/test_kfp_local.py: a trained model that beats its baseline.

A few updates of the random `micro` model never beat the untrained `micro` model, so to see the
promotion gate let a version through, the test puts this folder on PYTHONPATH with
OMTR_TEST_TRAINED_ORACLE=1. Python imports ``sitecustomize`` at start-up in every process the
pipeline's steps start, and this one changes exactly one command line: ``omtr evaluate --policy
model --model DIR`` where DIR is a model directory (the trained model the evaluate step passes)
becomes ``omtr evaluate --policy oracle`` (each task's reference: faithful success 1). The
evaluate-baseline step passes a profile name (``micro``), not a directory, and is left alone, as is
every other command: tasks, training, validation, registration and the gate itself run as they are.
"""

import os
import sys

if os.environ.get("OMTR_TEST_TRAINED_ORACLE") == "1" and sys.argv[:2] == ["-m", "evaluate"]:
    argv = sys.argv
    if "--policy" in argv and "--model" in argv and os.path.isdir(argv[argv.index("--model") + 1]):
        argv[argv.index("--policy") + 1] = "oracle"
        i = argv.index("--model")
        del argv[i:i + 2]
