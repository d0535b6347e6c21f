"""Celery workers that claim jobs and supervise the trainer."""
