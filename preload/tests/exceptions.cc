// ci/preload.sh: C++ exceptions thrown and caught, with allocation on both sides, run
// with and without LD_PRELOAD=libscalemem.so. The library links GCC's unwinder
// statically (preload/build.rs) and must keep it to itself: an exported `_Unwind_*`
// would take over the program's exceptions from its own libgcc_s.
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

static int throw_and_catch(int rounds)
{
	int caught = 0;
	for (int i = 0; i < rounds; i++) {
		try {
			std::vector<std::unique_ptr<std::string>> live;
			for (int j = 0; j < 8; j++)
				live.push_back(std::make_unique<std::string>(64 + j * 40, 'x'));
			if (i % 3 == 0)
				throw std::runtime_error("round " + std::to_string(i));
			throw i;
		} catch (const std::runtime_error &e) {
			caught += e.what()[0] == 'r';
		} catch (int n) {
			caught += n == i;
		}
	}
	return caught;
}

int main()
{
	int results[4] = {};
	std::vector<std::thread> threads;
	for (int t = 0; t < 4; t++)
		threads.emplace_back([&results, t] { results[t] = throw_and_catch(2000); });
	for (auto &t : threads)
		t.join();
	int total = throw_and_catch(2000);
	for (int r : results)
		total += r;
	std::printf("caught %d of 10000\n", total);
	return total == 10000 ? 0 : 1;
}
