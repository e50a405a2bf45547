"""A real Kubernetes control plane on loopback, for tests, the demo and benchmarks.

This package is a development tool, not part of the scheduler: nothing in
``bindery.scheduling``, ``bindery.rm`` or ``bindery.adapters`` imports it. It builds
etcd, kube-apiserver, kube-scheduler, kubectl and helm from Go modules
(:mod:`bindery.devcluster.binaries`), starts etcd and kube-apiserver with their own
PKI (:mod:`bindery.devcluster.plane`) and creates Nodes that kube-scheduler treats
as schedulable (:mod:`bindery.devcluster.nodes`).
"""
