"""The durable-run test bed: real parts on loopback, for tests and the local sandbox.

- ``controlplane``: a real etcd, kube-apiserver (RBAC on) and
  kube-controller-manager, built from their Go modules (``hack/build-binaries.sh``)
  or taken from envtest assets.
- ``s3``: a real MinIO server.
- ``processnode``: a stand-in for the kubelet (and the scheduler) that runs
  pods' containers as local processes and reports their status through the API.
- ``prometheus``: Debian's Prometheus scraping given targets.
- ``sandbox``: all of the above plus the operator, for ``make sandbox-up``.

Every process the test bed starts carries ``DURABLERUN_TESTBED_ID`` in its
environment, so a leak check can find any that outlive their test bed.
"""
