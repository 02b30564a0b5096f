// Load an AOTInductor package with libtorch's C++ loader and run it: no Python, no compiler (Chapter 6).
//
// This is the loading path PyTorch documents for production ("AOTInductor: Ahead-of-Time Compilation
// for Torch.Export-ed Models", section "Inference in C++"): torch::inductor::AOTIModelPackageLoader.
// graphbook.teach.restart_paths builds it once with g++ against the torch wheel's headers and libraries and
// starts it in fresh processes. Usage:
//
//   aoti_load PACKAGE.pt2 INPUT_DIR OUTPUT_DIR LAUNCHED_AT THREADS STEADY_RUNS BATCH [BATCH ...]
//
// It reads INPUT_DIR/input-b<BATCH>.npy (float32, C order), runs each batch size once in the given
// order, writes OUTPUT_DIR/out-b<BATCH>.npy, times STEADY_RUNS more calls of the first batch size and
// prints one line "GRAPHBOOK_RESULT {json}" with the same keys as the Python children. Times are
// measured against LAUNCHED_AT (seconds since the epoch, taken by the parent just before it started
// this process), so loading libtorch's shared libraries before main() counts in interpreter_s.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

double seconds_since_epoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A float32, C-order .npy file (what numpy.save writes for such an array) as a tensor.
at::Tensor read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  char magic[6];
  in.read(magic, 6);
  if (std::string(magic, 6) != "\x93NUMPY") throw std::runtime_error(path + " is not a .npy file");
  unsigned char version[2];
  in.read(reinterpret_cast<char*>(version), 2);
  uint32_t header_len = 0;
  if (version[0] == 1) {
    unsigned char b[2];
    in.read(reinterpret_cast<char*>(b), 2);
    header_len = b[0] | (b[1] << 8);
  } else {
    unsigned char b[4];
    in.read(reinterpret_cast<char*>(b), 4);
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t(b[3]) << 24);
  }
  std::string header(header_len, ' ');
  in.read(&header[0], header_len);
  if (header.find("'descr': '<f4'") == std::string::npos || header.find("'fortran_order': False") == std::string::npos)
    throw std::runtime_error(path + ": expected little-endian float32 in C order, header " + header);
  auto open = header.find('(', header.find("'shape'"));
  auto close = header.find(')', open);
  std::vector<int64_t> shape;
  std::stringstream dims(header.substr(open + 1, close - open - 1));
  for (std::string item; std::getline(dims, item, ',');)
    if (item.find_first_not_of(' ') != std::string::npos) shape.push_back(std::stoll(item));
  auto tensor = at::empty(shape, at::kFloat);
  in.read(reinterpret_cast<char*>(tensor.data_ptr<float>()), tensor.numel() * sizeof(float));
  if (!in) throw std::runtime_error(path + " is shorter than its header says");
  return tensor;
}

void write_npy(const std::string& path, const at::Tensor& value) {
  auto t = value.contiguous().to(at::kFloat);
  std::string shape;
  for (auto d : t.sizes()) shape += std::to_string(d) + ", ";
  if (t.dim() > 1) shape.resize(shape.size() - 1);  // numpy writes (1, 3) but (5,)
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + shape + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) throw std::runtime_error("cannot write " + path);
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  const char len_bytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(len_bytes, 2);
  out << header;
  out.write(reinterpret_cast<const char*>(t.data_ptr<float>()), t.numel() * sizeof(float));
}

}  // namespace

int main(int argc, char** argv) {
  const double main_at = seconds_since_epoch();
  if (argc < 8) {
    std::cerr << "usage: aoti_load PACKAGE.pt2 INPUT_DIR OUTPUT_DIR LAUNCHED_AT THREADS STEADY_RUNS BATCH [BATCH ...]\n";
    return 2;
  }
  try {
    const std::string package = argv[1], input_dir = argv[2], output_dir = argv[3];
    const double launched = std::stod(argv[4]);
    at::set_num_threads(std::stoi(argv[5]));
    const int steady_runs = std::stoi(argv[6]);
    std::vector<int> batches;
    for (int i = 7; i < argc; ++i) batches.push_back(std::stoi(argv[i]));
    double load_avg[1] = {0.0};
    getloadavg(load_avg, 1);
    c10::InferenceMode no_autograd;

    std::vector<at::Tensor> inputs;
    for (int b : batches) inputs.push_back(read_npy(input_dir + "/input-b" + std::to_string(b) + ".npy"));

    // open the package (the compiled shared library and the weights) ...
    double t0 = seconds_since_epoch();
    torch::inductor::AOTIModelPackageLoader loader(package);
    const double load_s = seconds_since_epoch() - t0;

    std::ostringstream first_calls, steady;
    first_calls.precision(9);
    steady.precision(9);
    double first_output_s = 0.0;
    std::vector<at::Tensor> outputs;
    for (size_t i = 0; i < batches.size(); ++i) {
      t0 = seconds_since_epoch();
      outputs.push_back(loader.run({inputs[i]}).at(0));  // ... and call it: a vector of tensors in and out
      const double call_s = seconds_since_epoch() - t0;
      if (i == 0) first_output_s = seconds_since_epoch() - launched;
      first_calls << (i ? ", " : "") << '"' << batches[i] << "\": " << call_s;
    }
    const double ready_s = seconds_since_epoch() - launched;

    for (int r = 0; r < steady_runs; ++r) {
      t0 = seconds_since_epoch();
      loader.run({inputs[0]});
      steady << (r ? ", " : "") << seconds_since_epoch() - t0;
    }
    for (size_t i = 0; i < batches.size(); ++i)
      write_npy(output_dir + "/out-b" + std::to_string(batches[i]) + ".npy", outputs[i]);

    std::cout.precision(17);
    std::cout << "GRAPHBOOK_RESULT {\"interpreter_s\": " << main_at - launched << ", \"import_s\": 0.0"
              << ", \"load_s\": " << load_s << ", \"first_output_s\": " << first_output_s
              << ", \"ready_s\": " << ready_s << ", \"first_call_s\": {" << first_calls.str() << "}"
              << ", \"steady_s\": [" << steady.str() << "], \"loadavg_1m\": " << load_avg[0]
              << ", \"torch_imported\": true}" << std::endl;
  } catch (const std::exception& exc) {
    std::cerr << "aoti_load: " << exc.what() << "\n";
    return 1;
  }
  return 0;
}
