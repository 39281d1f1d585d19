"""The programs on a laptop: the ``durablerun`` CLI, the kubectl plugin, the run browser, and what they show
(a run's journal, its timeline, reruns, the replay check of new code)."""
