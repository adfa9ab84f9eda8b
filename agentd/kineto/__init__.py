"""The dynolog-compatible endpoint that stock PyTorch (``KINETO_USE_DAEMON=1``) polls for trace configs."""
