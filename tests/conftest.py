"""Shared test settings: hypothesis profiles and the backends under test."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("default", max_examples=50, deadline=None)
settings.register_profile("fuzz", max_examples=2500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
