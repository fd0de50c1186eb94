"""Kubernetes support: rendering ``k8s/`` with kustomize (``kubectl kustomize``), the multi-node
training job builder (a Kubeflow Training Operator PyTorchJob or a Kubeflow Trainer v2 TrainJob with
its training runtime), and the deploy step's rollout of the serving Deployment."""
