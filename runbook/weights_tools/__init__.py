"""Weights tools below the steps: where a checkpoint's files land on a node (``layout``), the standard-library
downloader and verifier shipped to the nodes (``node_download``, ``verify_manifest``) and the kernel NFS share's
rendered commands and sudo rules (``nfs``) — used by step 02, by preflight's checks before the download and by the
benchmark's roofline (which reads the checkpoint where step 02 put it)."""
