#include <iostream>

#include "meshtrain/meshtrain.h"

int main() {
  mt::Array a = mt::Array::from_vector(std::vector<float>{1, 2, 3}, {3});
  std::cout << mt::sum(a * a).item() << "\n";
}
