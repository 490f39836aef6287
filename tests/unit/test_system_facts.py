from runbook.facts import system

OS_TEXT = '''PRETTY_NAME="Ubuntu 24.04.3 LTS"
NAME="Ubuntu"
VERSION_ID="24.04"
--
6.11.0-1016-nvidia
--
aarch64
--
spark-a1b2
'''


def test_parse_os():
    info = system.parse_os(OS_TEXT)
    assert info.pretty_name == "Ubuntu 24.04.3 LTS"
    assert (info.kernel, info.machine, info.hostname) == ("6.11.0-1016-nvidia", "aarch64", "spark-a1b2")


def test_parse_meminfo_in_bytes():
    mem = system.parse_meminfo("MemTotal:       127535404 kB\nMemAvailable:   121690000 kB\nHugePages_Total:       0\n")
    assert mem["MemAvailable"] == 121690000 * 1024
    assert mem["HugePages_Total"] == 0


def test_parse_disk_free():
    free = system.parse_disk_free("/mnt/nvme\n52345678848 253950091264 /mnt/nvme\n")
    assert (free.existing_path, free.avail_bytes, free.size_bytes, free.mount) == (
        "/mnt/nvme", 52345678848, 253950091264, "/mnt/nvme")


def test_parse_listening_with_and_without_process():
    text = ('LISTEN 0      128          0.0.0.0:22        0.0.0.0:*    users:(("sshd",pid=1,fd=3))\n'
            'LISTEN 0      4096               *:8000              *:*    users:(("python3",pid=88,fd=12))\n'
            'LISTEN 0      4096            [::]:29501           [::]:*\n')
    ports = system.parse_listening(text)
    assert ports[22] == "sshd(pid 1)" and ports[8000] == "python3(pid 88)" and ports[29501] == ""


def test_parse_image_present_and_absent():
    digest = "sha256:" + "ab" * 32
    info = system.parse_image(f'{digest} ["sha256:{"cd" * 32}"]\n')
    assert info.image_id == digest and info.layers == ["sha256:" + "cd" * 32]
    assert system.parse_image("Error: No such image: nvcr.io/x:y\n") is None
    assert system.parse_image("") is None


def test_parse_gpus():
    text = "GPU 0: NVIDIA GB10 (UUID: GPU-1234abcd-0000-1111-2222-333344445555)\n"
    assert system.parse_gpus(text) == ["NVIDIA GB10"]
    assert system.parse_gpus("nvidia-smi: command not found") == []


def test_disk_free_cmd_quotes_path():
    cmd = system.disk_free_cmd("/mnt/my dir; rm -rf /")
    assert "'/mnt/my dir; rm -rf /'" in cmd


# a dead network mount (its server gone) blocks every df/stat below it: preflight names it from /proc/mounts
PROC_MOUNTS = (  # captured on a lab worker after its cable's address went away (the sshfs stand-in of an NFS share)
    "/dev/vda /var/lib/nfs ext4 rw,relatime,discard,resv_strict,resuid=65534,resgid=65534 0 0\n"
    "169.254.77.1:/root/.cache/dsv41-flash-exl3/model /root/.cache/dsv41-flash-exl3/model fuse.sshfs "
    "ro,nosuid,nodev,relatime,user_id=0,group_id=0,allow_other 0 0\n"
    "proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0\n"
    "spark1:/srv/my\\040models /mnt/my\\040models nfs4 rw,relatime,vers=4.2,hard,proto=tcp 0 0\n")


def test_network_mounts_are_read_from_proc_mounts_with_their_escapes():
    mounts = system.parse_network_mounts(PROC_MOUNTS)
    assert [(m.fstype, m.source, m.mountpoint) for m in mounts] == [
        ("fuse.sshfs", "169.254.77.1:/root/.cache/dsv41-flash-exl3/model", "/root/.cache/dsv41-flash-exl3/model"),
        ("nfs4", "spark1:/srv/my models", "/mnt/my models")]


def test_a_mount_that_does_not_answer_is_named_by_the_probe_run_in_a_real_shell(tmp_path):
    import subprocess
    gone = system.Mount("spark1:/srv/x", str(tmp_path / "not there"), "nfs4")     # stat fails like a dead server
    alive = system.Mount("spark1:/srv/y", str(tmp_path), "nfs4")
    cmd = system.unanswered_mounts_cmd([gone, alive], seconds=2)
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert system.parse_unanswered_mounts(out.stdout, [gone, alive]) == [gone]
    assert system.unanswered_mounts_cmd([]) == "true"


def test_a_timed_out_probe_gets_a_fix_naming_the_mount_that_does_not_answer():
    from runbook.errors import RemoteError
    from runbook.preflight.verify import _why_unreadable
    from runbook.remote import Cluster, CommandLog
    from support.profiles import profile_from
    mounts = system.parse_network_mounts(PROC_MOUNTS)
    facts = {system.MOUNTS_CMD: PROC_MOUNTS,
             system.unanswered_mounts_cmd(mounts): "NOANSWER /root/.cache/dsv41-flash-exl3/model\n"}
    worker = Cluster.offline(profile_from("env/lab.env"), facts={"worker": facts}, log=CommandLog(None)).workers[0]
    fix = _why_unreadable(worker, RemoteError("command timed out after 30 s (its 1 process(es) were killed)"))
    assert "fuse.sshfs 169.254.77.1:/root/.cache/dsv41-flash-exl3/model on /root/.cache/dsv41-flash-exl3/model" in fix
    assert "sudo umount -l /root/.cache/dsv41-flash-exl3/model" in fix and "my models" not in fix
    # every mount answering: the fix says where to look instead of naming one
    facts = {**facts, system.unanswered_mounts_cmd(mounts): ""}
    worker = Cluster.offline(profile_from("env/lab.env"), facts={"worker": facts}, log=CommandLog(None)).workers[0]
    assert "every network mount answering" in _why_unreadable(worker, RemoteError("command timed out after 30 s"))
