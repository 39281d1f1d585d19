"""The process node: a stand-in for the kubelet (and the scheduler) on a bare API server.

It is NOT a kubelet and makes no claim to be one. It does the part of a
kubelet's job the tests and the sandbox rely on, for real, through the real
API server:

- registers a Node, binds every unscheduled pod to it (the scheduler's job);
- runs each container's ``command`` + ``args`` as a local process, with the
  pod's env (``value``, ``valueFrom`` Secret/ConfigMap keys, field refs,
  ``envFrom``), ``workingDir`` and ``runAsUser``/``runAsGroup``;
- gives each container a private mount namespace in which its
  ``terminationMessagePath``, its ServiceAccount token (a real bound token from
  the TokenRequest API, at the in-cluster path), and its ``emptyDir``,
  ``hostPath``, ``secret`` and ``configMap`` volumes are mounted, and ``/`` is
  read-only when ``readOnlyRootFilesystem`` says so;
- reports what a kubelet reports: pod phase, conditions, container state
  (running / terminated with exit code, reason and the termination message);
- honours graceful deletion (SIGTERM, grace period, SIGKILL) and restart
  policies (restarting containers of Deployment pods);
- on request, through a small HTTP control API on loopback: SIGKILLs a
  container (exit 137), marks it OOMKilled, pauses/continues it (SIGSTOP and
  SIGCONT; while paused the node also ignores the pod, as a partitioned node
  would: a deletion, a forced one too, reaches the process only once it is continued), or loses the node under a pod
  (the process dies unreported, the pod gets a DisruptionTarget condition and
  is force-deleted, as the taint manager and pod GC do for a lost node).

What it does not do: images (the command runs on this machine with the node's
base environment standing in for the image; a container whose image is named by
its digest reports that digest as its imageID, so runs can be pinned here), probes (a running container is
ready), resource limits, networking (pods share the host's loopback), logs
through the API (each container logs to a file under the node's state dir).
It needs root: mount namespaces and ``setpriv``.
"""

from durablerun_testbed.processnode.control import main

__all__ = ["main"]
