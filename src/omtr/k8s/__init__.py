"""Kubernetes support: the kustomize renderer for ``k8s/``, the PyTorchJob builder for multi-node
training, and the deploy step's rollout of the serving Deployment."""
