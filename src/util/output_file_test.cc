#include "util/output_file.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>

#include "support/test_data.h"

namespace kvx {
namespace {

// A fresh directory per test, so leftover temporary files can be counted.
std::string FreshDir(const std::string& name) {
  const std::string dir = testing::TempDir() + "/out_" + name;
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void Write(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

int CountEntries(const std::string& dir) {
  int n = 0;
  DIR* d = ::opendir(dir.c_str());
  while (dirent* e = d ? ::readdir(d) : nullptr) n += std::string(e->d_name) != "." && std::string(e->d_name) != "..";
  if (d) ::closedir(d);
  return n;
}

mode_t LstatMode(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode;
}

// Refused with InvalidArgument whose message names the path and `kind`,
// by both the check and the write; the target is left as it was.
void ExpectRefused(const std::string& path, const std::string& kind) {
  const mode_t before = LstatMode(path);
  for (const Status& s : {CheckOutputFile(path), WriteFileAtomically(path, "bytes")}) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(kind), std::string::npos) << s.message();
  }
  EXPECT_EQ(LstatMode(path), before) << path << " was replaced";
}

TEST(OutputFileTest, NewFileIsWritten) {
  const std::string dir = FreshDir("new");
  ASSERT_TRUE(WriteFileAtomically(dir + "/a.json", "{}\n").ok());
  EXPECT_EQ(ReadAll(dir + "/a.json"), "{}\n");
  EXPECT_EQ(CountEntries(dir), 1);  // no temporary file left
}

TEST(OutputFileTest, RegularFileIsReplacedAndKeepsItsMode) {
  const std::string dir = FreshDir("regular");
  const std::string path = dir + "/a.txt";
  Write(path, "old contents, longer than the new ones");
  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);
  struct stat before {};
  ASSERT_EQ(::stat(path.c_str(), &before), 0);
  ASSERT_TRUE(WriteFileAtomically(path, "new").ok());
  EXPECT_EQ(ReadAll(path), "new");
  struct stat after {};
  ASSERT_EQ(::stat(path.c_str(), &after), 0);
  EXPECT_NE(after.st_ino, before.st_ino) << "replaced by rename, not rewritten in place";
  EXPECT_EQ(after.st_mode & 07777, 0640u);
  EXPECT_EQ(CountEntries(dir), 1);
}

TEST(OutputFileTest, UncommittedWriteLeavesTheTargetAlone) {
  const std::string dir = FreshDir("uncommitted");
  const std::string path = dir + "/a.txt";
  Write(path, "old");
  {
    auto f = OutputFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    ASSERT_TRUE(f->Write("half of the new").ok());
    EXPECT_EQ(ReadAll(path), "old");  // nothing visible before Commit
  }  // dropped: a failed command
  EXPECT_EQ(ReadAll(path), "old");
  EXPECT_EQ(CountEntries(dir), 1);
}

TEST(OutputFileTest, SymlinkIsFollowedAndTheLinkKept) {
  const std::string dir = FreshDir("symlink");
  const std::string target = dir + "/real.json", link = dir + "/link.json", chain = dir + "/chain.json";
  Write(target, "old");
  ASSERT_EQ(::symlink("real.json", link.c_str()), 0);
  ASSERT_EQ(::symlink(link.c_str(), chain.c_str()), 0);  // a link to a link
  ASSERT_TRUE(WriteFileAtomically(chain, "new").ok());
  EXPECT_TRUE(S_ISLNK(LstatMode(link)));
  EXPECT_TRUE(S_ISLNK(LstatMode(chain)));
  EXPECT_EQ(ReadAll(target), "new");
  EXPECT_EQ(CountEntries(dir), 3);
}

TEST(OutputFileTest, DanglingSymlinkIsRefused) {
  const std::string dir = FreshDir("dangling");
  ASSERT_EQ(::symlink("missing.json", (dir + "/link.json").c_str()), 0);
  ExpectRefused(dir + "/link.json", "does not exist");
  EXPECT_EQ(CountEntries(dir), 1);
}

TEST(OutputFileTest, FifoIsRefusedNotOpened) {
  const std::string dir = FreshDir("fifo");
  const std::string fifo = dir + "/pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  ExpectRefused(fifo, "a pipe");  // opening it for writing would block: no reader
  EXPECT_TRUE(S_ISFIFO(LstatMode(fifo)));
  EXPECT_EQ(CountEntries(dir), 1);
}

TEST(OutputFileTest, SymlinkToFifoIsRefused) {
  const std::string dir = FreshDir("link_fifo");
  ASSERT_EQ(::mkfifo((dir + "/pipe").c_str(), 0644), 0);
  ASSERT_EQ(::symlink("pipe", (dir + "/link").c_str()), 0);
  ExpectRefused(dir + "/link", "a symbolic link to a pipe");
  EXPECT_TRUE(S_ISFIFO(LstatMode(dir + "/pipe")));
}

TEST(OutputFileTest, DirectoryIsRefused) {
  const std::string dir = FreshDir("directory");
  ::mkdir((dir + "/sub").c_str(), 0755);
  ExpectRefused(dir + "/sub", "a directory");
  EXPECT_EQ(CountEntries(dir), 1);
}

TEST(OutputFileTest, DeviceIsRefused) {
  // The check alone never writes, so it may look at the real /dev/null.
  const Status check = CheckOutputFile("/dev/null");
  EXPECT_EQ(check.code(), StatusCode::kInvalidArgument) << check.ToString();
  EXPECT_NE(check.message().find("it is a device"), std::string::npos) << check.message();
  // Root could rename over a device: then a null device node of our own, so
  // that a regression replaces it and never the system's /dev/null.
  if (::geteuid() != 0) {
    ExpectRefused("/dev/null", "a device");
    return;
  }
  const std::string dir = FreshDir("device");
  const std::string dev = dir + "/null";
  if (::mknod(dev.c_str(), S_IFCHR | 0666, ::makedev(1, 3)) != 0) GTEST_SKIP() << "cannot mknod here";
  ExpectRefused(dev, "a device");
  EXPECT_TRUE(S_ISCHR(LstatMode(dev)));
  EXPECT_EQ(CountEntries(dir), 1);
}

TEST(OutputFileTest, MissingDirectoryIsAnIoError) {
  const Status s = WriteFileAtomically(FreshDir("missing_dir") + "/no/such/dir/a.json", "x");
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_NE(s.message().find("does the directory exist"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace kvx
