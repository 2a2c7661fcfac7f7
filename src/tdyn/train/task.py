"""Shim (issue 13): the task contract moved to :mod:`tdyn.tasks.base`. Kept so that modules written
against ``tdyn.train.task`` (the topic and decision-list experiments) import unchanged; remove after
they import ``tdyn.tasks``."""

from tdyn.tasks import Member, Task, TaskSpec, all_tasks, get_task, register_task  # noqa: F401
