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
