"""Kubernetes support: rendering ``k8s/`` with kustomize (``kubectl kustomize``), the PyTorchJob
builder for multi-node training, and the deploy step's rollout of the serving Deployment."""
